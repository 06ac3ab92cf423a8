"""The async Python SDK: talk to Quill over NATS with typed results.

::

    async with await Quill.connect("nats://127.0.0.1:4222", actor="agent-7") as quill:
        ws = quill.workspace("acme/demo")
        await ws.create(exist_ok=True)
        written = await ws.write("notes.txt", "hello\\n")
        text = await ws.read_text("notes.txt")

Every failure is a ``QuillError`` with a stable ``code``. Reads see your own writes: each
``Workspace`` remembers the highest version it has seen and passes it as ``min_version``.
A command that times out is retried with the same request id, so it is applied once.

The SDK in modules: ``Quill`` (here) connects and sends; ``Workspace`` and ``Run``
(``quill/workspace.py``, its reads in ``quill/_reads.py`` over ``quill/_handle.py``) say what
each op sends; ``quill/_transport.py`` is how a request travels (headers, retries, timeouts,
NATS's failures as error codes). ``quill.client`` still names all of them, as it always has.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.nuid import NUID

from contracts import codec, ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import TENANT_SCOPE, Origin, Subjects, check_id, split_workspace
from quill import _transport, connection, inboxes
from quill._handle import remember
from quill._transport import (
    CONFLICT_BASE_S,
    CONFLICT_CAP_S,
    FAILOVER_S,
    MAX_RETRY_AFTER_S,
    SILENCE_S,
    OnOutput,
    backoff,
    check_size,
    conflict_backoff,
)
from quill.credentials import NatsAuth
from quill.waiting import Asked, Waiting
from quill.workspace import Run, Workspace

R = TypeVar("R")
T = TypeVar("T")

__all__ = [
    "ErrorCode",
    "Quill",
    "QuillError",
    "Run",
    "Workspace",
    # the SDK's knobs, named here since before they moved to quill/_transport.py
    "CONFLICT_BASE_S",
    "CONFLICT_CAP_S",
    "FAILOVER_S",
    "MAX_RETRY_AFTER_S",
    "SILENCE_S",
    "OnOutput",
    "backoff",
    "check_size",
    "conflict_backoff",
]


class Quill:
    """A connection to a Quill deployment."""

    def __init__(
        self,
        nc: NATS,
        *,
        actor: str | None = None,
        session: str | None = None,
        run: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        root: str = "ws",
        exec_silence_s: float = SILENCE_S,
        wait_ms: int = 0,
        failover_s: float = FAILOVER_S,
        conflict_retries: int = 0,
        waiting: Waiting | None = None,
    ) -> None:
        self.nc = inboxes.harden(nc)
        self.waiting = waiting or Waiting()
        """How commands and exec requests are sent (``quill/waiting.py``): once, with their
        wait, unless a program (the CLI) shows what they wait for."""
        self.failover_s = failover_s
        """How long commands and queries keep retrying ``UNAVAILABLE`` (no writer for the
        workspace yet, a partition changing hands) before giving up."""
        self.conflict_retries = conflict_retries
        """How many times ``retry_conflicts`` (and ``Workspace.update``) run their attempt
        again after a ``CONFLICT`` when the call does not say: none unless asked. A command
        is never sent again on ``CONFLICT`` by itself (the same request would conflict
        again): the attempt reads anew and decides again."""
        self.wait_ms = wait_ms
        """How long a command may wait for another session's lock or for its approval
        (``Ws-Wait``) before ``LOCKED``/``APPROVAL_REQUIRED``."""
        self.exec_silence_s = exec_silence_s
        """A command's executor heard from less recently than this is given up for lost."""
        self.subjects = Subjects(root)
        self.actor, self.session, self.run = actor, session, run
        self.timeout, self.retries = timeout, retries
        self._workspaces: OrderedDict[str, Workspace] = OrderedDict()
        """Handles by name, the ``SDK_WORKSPACES`` most recently asked for."""
        self._nuid = NUID()  # unique request ids, far cheaper than uuid4
        self._seen: OrderedDict[str, int] = OrderedDict()
        """Highest version seen per workspace, shared by every view (``as_actor``): of the
        ``SDK_WORKSPACES`` most recently seen (``contracts/limits.py``)."""

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str] | None = None,
        *,
        user: str | None = None,
        password: str | None = None,
        nkey_seed: str | None = None,
        inbox_prefix: str | None = None,
        **options: Any,
    ) -> Quill:
        """Connect to NATS (``url`` defaults to ``QUILL_NATS_URL`` or the local ``quill up``).
        A cluster: several URLs, comma-separated in one string or as a list; the client
        fails over between them.

        A server with tenants (docs/operations.md) wants a tenant's ``user`` and ``password``,
        or ``nkey_seed`` (a seed file), and replies on the tenant's own inboxes:
        ``inbox_prefix`` defaults to ``_INBOX_<user>``, so an nkey tenant names it
        (``_INBOX_<tenant>``). Without any of them, ``QUILL_NATS_USER``,
        ``QUILL_NATS_PASSWORD``, ``QUILL_NATS_NKEY`` and ``QUILL_NATS_INBOX`` apply.

        Raises:
            QuillError: ``UNAVAILABLE`` if NATS cannot be reached (or refuses the
                credentials), ``INVALID_ARGUMENT`` for incomplete credentials.
        """
        url = url or connection.discover_url()
        auth = NatsAuth(user, password, nkey_seed, inbox_prefix)
        if user is None and password is None and nkey_seed is None:
            env = NatsAuth.from_env()
            auth = dataclasses.replace(env, inbox_prefix=inbox_prefix or env.inbox_prefix)
        try:
            auth.options()
        except ValueError as exc:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
        wait_s = options.pop("connect_wait", 5.0)
        try:
            nc = await connection.connect(url, name="quill-sdk", wait_s=wait_s, auth=auth)
        except ConnectionError as exc:
            raise QuillError(ErrorCode.UNAVAILABLE, str(exc)) from None
        return cls(nc, **options)

    async def close(self) -> None:
        await self.nc.close()

    async def __aenter__(self) -> Quill:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @classmethod
    def of(cls, ws: Workspace) -> Quill:
        """The client that made ``ws``, as a ``Quill``: ``ws.client`` is typed by the little
        a workspace uses of its client (``quill._protocols.Client``), so the workspace's
        module need not import this one (no circle, not even in annotations)."""
        client = ws.client
        if not isinstance(client, Quill):
            raise TypeError(f"{ws!r} was made by {type(client).__name__}, not Quill")
        return client

    def as_actor(
        self, actor: str | None, *, session: str | None = None, run: str | None = None
    ) -> Quill:
        """A view of this client that names another actor (session, run) in its requests, on
        the same connection; what it writes, every view reads (read-your-writes is shared)."""
        view = Quill(
            self.nc,
            actor=actor,
            session=session,
            run=run,
            timeout=self.timeout,
            retries=self.retries,
            root=self.subjects.root,
            exec_silence_s=self.exec_silence_s,
            wait_ms=self.wait_ms,
            failover_s=self.failover_s,
            conflict_retries=self.conflict_retries,
            waiting=self.waiting,
        )
        view._seen, view._nuid = self._seen, self._nuid
        return view

    def workspace(self, name: str) -> Workspace:
        """The workspace ``tenant/workspace`` (one handle per name, shared, while it is among
        the ``SDK_WORKSPACES`` most recently asked for)."""
        handle = self._workspaces.get(name)
        if handle is None:
            tenant, ws = split_workspace(name)
            handle = remember(self._workspaces, name, Workspace(self, tenant, ws))
        else:
            self._workspaces.move_to_end(name)
        return handle

    async def fork(self, source: str, new: str, *, version: int | None = None) -> rp.Forked:
        """Fork ``source`` (``tenant/workspace``) at ``version`` (its latest) as ``new`` (a
        name, or ``tenant/name`` of the same tenant): nothing is copied, ``new``'s history up
        to there is the source's and it goes on from the next version.

        Raises:
            QuillError: ``ALREADY_EXISTS`` (``new`` exists, or is the source),
                ``WORKSPACE_NOT_FOUND`` (no source), ``INVALID_ARGUMENT`` (no such version,
                another tenant), ``VERSION_TRIMMED`` (compacted away).
        """
        tenant, name = split_workspace(source)
        target = new if "/" in new else f"{tenant}/{new}"
        if split_workspace(target)[0] != tenant:
            raise QuillError(
                ErrorCode.INVALID_ARGUMENT,
                f"A fork stays within its tenant: {target} is not {tenant}'s",
                {"source": source, "fork": target},
            )
        handle = self.workspace(target)
        result: rp.Forked = await handle._cmd(rq.ForkWorkspace(source=name, version=version))
        return result

    async def workspaces(
        self,
        tenant: str,
        *,
        after: str | None = None,
        limit: int = 100,
        prefix: str | None = None,
    ) -> rp.WorkspaceList:
        """A page of ``tenant``'s workspaces by name (``next``: pass as ``after`` for the
        next page), each with its version, size, last change, trust, lock and archive state.

        Raises:
            QuillError: ``INVALID_ARGUMENT`` for a bad tenant id or limit; ``ACCESS_DENIED``
                for another tenant's (under ``--tenants``).
        """
        body = rq.ListWorkspaces(after=after, limit=limit, prefix=prefix)
        return (await self.send(check_id("tenant", tenant), TENANT_SCOPE, body))[1]

    async def all_workspaces(
        self, tenant: str, *, prefix: str | None = None, page: int = 500
    ) -> AsyncIterator[rp.WorkspaceSummary]:
        """Every workspace of ``tenant`` by name, a page (``workspaces``) at a time."""
        after: str | None = None
        while True:
            listing = await self.workspaces(tenant, after=after, limit=page, prefix=prefix)
            for summary in listing.workspaces:
                yield summary
            if listing.next is None:
                return
            after = listing.next

    async def send(
        self,
        tenant: str,
        workspace: str,
        body: rq.Request,
        *,
        request_id: str | None = None,
        wait_ms: int | None = None,
    ) -> tuple[int | None, Any]:
        """Send ``body`` as the op the registry (``contracts/ops.py``) has for its type, and
        decode the reply to that op's result type (``request`` for what else holds).

        Raises:
            QuillError: as ``request``.
        """
        spec = ops.of_request(body)
        if spec.scope == "tenant":
            workspace = TENANT_SCOPE  # the tenant's op: sent as no workspace's
        return await self.request(
            spec.kind, tenant, workspace, spec.name, body, spec.result,
            request_id=request_id, wait_ms=wait_ms,
        )  # fmt: skip

    async def request(
        self,
        kind: str,
        tenant: str,
        workspace: str,
        op: str,
        body: msgspec.Struct,
        result_type: type[R],
        *,
        request_id: str | None = None,
        wait_ms: int | None = None,
    ) -> tuple[int | None, R]:
        """Send one request (retrying retriable failures with the same request id); a
        command, as ``waiting`` sends it.

        Raises:
            QuillError: the reply's error, ``TIMEOUT`` or ``UNAVAILABLE``.
        """
        subject = self.subjects.request(kind, tenant, workspace, op)
        # Commands carry a request id (idempotent retries); queries need none, and go without
        # headers at all unless there is someone to name in the audit record.
        rid = request_id
        if rid is None:
            rid = self._nuid.next().decode() if kind != "qry" else ""
        data = _transport.encode(body)

        def send(ms: int) -> Awaitable[tuple[int | None, R]]:
            timeout = self.timeout + ms / 1000
            origin = Origin(rid, self.actor, self.session, self.run, ms)
            return _transport.request(
                self.nc,
                subject,
                data,
                result_type,
                kind=kind,
                op=op,
                tenant=tenant,
                headers=_transport.request_headers(kind, op, origin, timeout),
                timeout=timeout,
                retries=self.retries,
                failover_s=self.failover_s,
            )

        if kind != "cmd":
            return await send(wait_ms or 0)
        wait = self.wait_ms if wait_ms is None else wait_ms
        return await self.waiting.send(Asked(kind, tenant, workspace, op, rid, wait), send)

    async def retry_conflicts(
        self, attempt: Callable[[], Awaitable[T]], *, retries: int | None = None
    ) -> T:
        """``attempt()``, run again after it raises ``CONFLICT``, up to ``retries`` times
        (default: ``conflict_retries``, 0 unless the client was made with more), each time
        after a jittered backoff (``conflict_backoff``). ``attempt`` reads what it depends on
        and sends its command with ``if_match`` or ``expected_version``: a conflict means that
        what it read changed, so it must read again, not resend.

        Raises:
            QuillError: ``CONFLICT`` when the last attempt conflicted; any other error at once.
        """
        most = self.conflict_retries if retries is None else retries
        for n in itertools.count():
            try:
                return await attempt()
            except QuillError as exc:
                if exc.code != ErrorCode.CONFLICT or n >= most:
                    raise
            await asyncio.sleep(conflict_backoff(n))
        raise AssertionError("unreachable")

    async def exec_request(
        self,
        tenant: str,
        workspace: str,
        op: str,
        body: msgspec.Struct,
        result_type: type[R],
        *,
        request_id: str,
        deadline_s: float,
        heard: Callable[[], float],
    ) -> tuple[int | None, R]:
        """Send an exec request and wait for its reply while the executor keeps announcing it
        alive (``heard()``: when it last did). Retried only when it cannot have run (no
        executor, or one too busy to take it); a lost executor is an error, not a retry.

        Raises:
            QuillError: the reply's error; ``UNAVAILABLE`` when no executor answers or the one
                running it stopped answering; ``TIMEOUT`` past ``deadline_s``.
        """
        subject = self.subjects.exec(tenant, workspace, op)
        data = codec.encode(body)

        def send(ms: int) -> Awaitable[tuple[int | None, R]]:
            return _transport.exec_request(
                self.nc,
                subject,
                data,
                result_type,
                op=op,
                tenant=tenant,
                headers=Origin(request_id, self.actor, self.session, self.run, ms).headers(),
                retries=self.retries,
                deadline_s=deadline_s,
                silence_s=self.exec_silence_s,
                heard=heard,
            )

        asked = Asked("exec", tenant, workspace, op, request_id, self.wait_ms)
        return await self.waiting.send(asked, send)
