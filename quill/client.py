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

Size: the SDK's public surface (``Quill``, ``Workspace``, ``Run``) in one module, so that a
user reads it top to bottom; each method is a few lines saying how its arguments make the
request, since the op and the result type come from the registry (``contracts/ops.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.nuid import NUID

from contracts import codec, ops
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError, retry_after_ms
from contracts.events import AuditRecord, WorkspaceUpdated
from contracts.limits import CEILINGS, SDK_WORKSPACES, LimitsPatch, check_stdin
from contracts.paths import normalize, printable
from contracts.subjects import (
    COSTLY_QUERIES,
    HEADER_REQUEST_ID,
    HEADER_STREAM,
    MAX_WAIT_MS,
    STREAM_AUDIT,
    TENANT_SCOPE,
    Origin,
    Subjects,
    check_id,
    split_workspace,
)
from quill import connection, inboxes
from quill.credentials import NatsAuth

R = TypeVar("R")
T = TypeVar("T")

SILENCE_S = 15.0
"""An executor announces a request it holds every 2 s; this long without a word, it is lost."""
FAILOVER_S = 15.0
"""Default of ``Quill.failover_s``: longer than a writer lease (5 s) plus its takeover."""
CONFLICT_BASE_S = 0.005
CONFLICT_CAP_S = 1.0
"""The backoff before a ``CONFLICT``'s retry ``n`` is drawn from ``[0, min(CAP, BASE * 2**n)]``
(full jitter: clients that conflicted together come back spread out, not together)."""

__all__ = ["Quill", "QuillError", "ErrorCode", "Workspace"]


def _not_text(value: Any, key: str = "request") -> QuillError:
    """The refusal of a request holding a string that is not text (a lone surrogate, as Python
    shows a byte that is not UTF-8 in a name from argv or the disk): for a path, the server's
    own (``contracts.paths``); else ``INVALID_ARGUMENT`` naming the field."""
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    for k, v in items:
        name = k if isinstance(k, str) else key
        for text in (k, v) if isinstance(k, str) else (v,):
            if isinstance(text, str) and not _encodable(text):
                if name in ("path", "to", "workdir") and text is v:
                    normalize(v)  # raises the rule's INVALID_ARGUMENT
                label, shown = name if text is v else key, printable(text)[:100]
                return QuillError(ErrorCode.INVALID_ARGUMENT, f"{label} is not UTF-8: '{shown}'")
        if isinstance(v, dict | list):
            found = _not_text(v, name)
            if found.details.get("field") != "?":
                return found
    return QuillError(ErrorCode.INVALID_ARGUMENT, f"{key} is not UTF-8", {"field": "?"})


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_size(content: str | bytes) -> None:
    """Refuse content no workspace takes before encoding it (a character is at least a byte).

    Raises:
        QuillError: ``SIZE_LIMIT_EXCEEDED`` over ``CEILINGS.max_file_bytes``.
    """
    most = CEILINGS.max_file_bytes
    if len(content) > most:
        raise QuillError(
            ErrorCode.SIZE_LIMIT_EXCEEDED,
            f"Content is over {most} bytes, the largest file a workspace may take",
            {"max_file_bytes": most},
        )


def _refused(subject: str) -> QuillError:
    """The NATS server refused a request: these credentials are another tenant's."""
    return QuillError(
        ErrorCode.ACCESS_DENIED,
        f"NATS refused {subject} to these credentials (a tenant reaches only its own workspaces)",
        {"subject": subject},
    )


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
    ) -> None:
        self.nc = inboxes.harden(nc)
        self.failover_s = failover_s
        self.conflict_retries = conflict_retries
        """How many times ``retry_conflicts`` (and ``Workspace.update``) run their attempt
        again after a ``CONFLICT`` when the call does not say: none unless asked. A command
        is never sent again on ``CONFLICT`` by itself (the same request would conflict
        again): the attempt reads anew and decides again."""
        """How long commands and queries keep retrying ``UNAVAILABLE`` (no writer for the
        workspace yet, a partition changing hands) before giving up."""
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
        )
        view._seen, view._nuid = self._seen, self._nuid
        return view

    def workspace(self, name: str) -> Workspace:
        """The workspace ``tenant/workspace`` (one handle per name, shared, while it is among
        the ``SDK_WORKSPACES`` most recently asked for)."""
        handle = self._workspaces.get(name)
        if handle is None:
            tenant, ws = split_workspace(name)
            handle = self._workspaces[name] = Workspace(self, tenant, ws)
            if len(self._workspaces) > SDK_WORKSPACES:
                self._workspaces.popitem(last=False)
        else:
            self._workspaces.move_to_end(name)
        return handle

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
        """Send one request (retrying retriable failures with the same request id).

        Raises:
            QuillError: the reply's error, ``TIMEOUT`` or ``UNAVAILABLE``.
        """
        subject = self.subjects.request(kind, tenant, workspace, op)
        # Commands carry a request id (idempotent retries); queries need none, and go without
        # headers at all unless there is someone to name in the audit record.
        if request_id is None:
            request_id = self._nuid.next().decode() if kind != "qry" else ""
        if wait_ms is None:
            wait_ms = self.wait_ms if kind == "cmd" else 0
        timeout = self.timeout + wait_ms / 1000
        # Work that can be expensive is not started (or is stopped) once we stop waiting.
        waits = round(timeout * 1000) if kind == "cmd" or op in COSTLY_QUERIES else 0
        headers: dict[str, str] | None = None
        if request_id or wait_ms or waits or self.actor or self.session or self.run:
            named = Origin(
                request_id,
                self.actor,
                self.session,
                self.run,
                wait_ms,
                timeout_ms=min(waits, MAX_WAIT_MS),
            ).headers()
            if not request_id:
                del named[HEADER_REQUEST_ID]
            headers = named
        try:
            data = codec.encode(body)
        except UnicodeEncodeError:  # a lone surrogate: a byte of an argv name not UTF-8
            raise _not_text(msgspec.to_builtins(body)) from None
        last: QuillError | None = None
        failover_until = time.monotonic() + self.failover_s
        attempt = -1
        while self._again(attempt := attempt + 1, last, failover_until):
            if attempt:
                await asyncio.sleep(backoff(attempt, last, 1.0))
            try:
                msg = await inboxes.request(
                    self.nc, subject, data, timeout=timeout, headers=headers, tenant=tenant
                )
            except nats.errors.TimeoutError:
                if connection.refused(self.nc, subject):
                    raise _refused(subject) from None
                last = QuillError(ErrorCode.TIMEOUT, f"No reply to {kind}.{op} in {timeout}s")
                continue
            except nats.errors.MaxPayloadError:
                raise QuillError(
                    ErrorCode.SIZE_LIMIT_EXCEEDED,
                    f"Request of {len(data)} bytes exceeds the server's message size",
                    {"bytes": len(data)},
                ) from None
            except nats.errors.NoRespondersError:
                service = {"cmd": "writer", "qry": "reader", "exec": "executor"}.get(kind, kind)
                last = QuillError(ErrorCode.UNAVAILABLE, f"No Quill {service} is running")
                continue
            except nats.errors.Error as exc:
                last = QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}")
                continue
            try:
                return codec.decode_reply(msg.data, result_type)
            except QuillError as exc:
                if not exc.retriable:
                    raise
                last = exc
        assert last is not None
        raise last

    def _again(self, attempt: int, last: QuillError | None, failover_until: float) -> bool:
        """Whether to send (again): the first time; then up to ``retries`` times; and while a
        service is missing or handing over (``UNAVAILABLE``: a writer failing over, a
        partition moving), until ``failover_s`` has passed, unless retries are off."""
        if attempt == 0 or attempt <= self.retries:
            return True
        return (
            self.retries > 0
            and last is not None
            and last.code == ErrorCode.UNAVAILABLE
            and time.monotonic() < failover_until
        )

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
        origin = Origin(request_id, self.actor, self.session, self.run, self.wait_ms)
        headers = origin.headers()
        data = codec.encode(body)
        last: QuillError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(backoff(attempt, last, 2.0))
            sent = time.monotonic()
            pending = asyncio.ensure_future(
                inboxes.request(
                    self.nc, subject, data, timeout=deadline_s, headers=headers, tenant=tenant
                )
            )
            try:
                silence = self.exec_silence_s
                while not (await asyncio.wait({pending}, timeout=silence / 3))[0]:
                    if connection.refused(self.nc, subject):
                        raise _refused(subject)
                    if time.monotonic() - max(heard(), sent) > silence:
                        raise QuillError(
                            ErrorCode.UNAVAILABLE,
                            f"The executor running {op} stopped answering (nothing heard for "
                            f"{silence:.0f}s); what it changed, if anything, is in the "
                            "workspace's history",
                        )
                msg = pending.result()
            except nats.errors.NoRespondersError:
                last = QuillError(ErrorCode.UNAVAILABLE, "No Quill executor is running")
                continue
            except nats.errors.TimeoutError:
                raise QuillError(
                    ErrorCode.TIMEOUT, f"No reply to exec.{op} in {deadline_s:.0f}s"
                ) from None
            except nats.errors.MaxPayloadError:
                raise QuillError(
                    ErrorCode.SIZE_LIMIT_EXCEEDED,
                    f"Request of {len(data)} bytes exceeds the server's message size",
                ) from None
            except nats.errors.Error as exc:
                raise QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}") from None
            finally:
                if not pending.done():
                    pending.cancel()
            try:
                return codec.decode_reply(msg.data, result_type)
            except QuillError as exc:
                if exc.code != ErrorCode.UNAVAILABLE:
                    raise
                last = exc  # refused before running (busy, log unreachable): try again
        assert last is not None
        raise last


MAX_RETRY_AFTER_S = 30.0
"""The longest a busy answer's ``retry_after_ms`` makes a retry wait."""


def backoff(attempt: int, last: QuillError | None, cap: float) -> float:
    """Seconds to wait before retry ``attempt``: ``0.1 * 2**attempt`` (at most ``cap``), or,
    after a busy answer, its ``retry_after_ms`` if longer (at most ``MAX_RETRY_AFTER_S``),
    spread by up to a quarter more so that the clients a flood refused do not all come back
    at the same moment."""
    pause = min(0.1 * 2**attempt, cap)
    hint = retry_after_ms(last) if last is not None else None
    if hint is None:
        return pause
    return max(pause, min(hint / 1000, MAX_RETRY_AFTER_S)) * random.uniform(1.0, 1.25)


def conflict_backoff(retry: int) -> float:
    """Seconds to wait before a ``CONFLICT``'s retry ``retry`` (0-based): uniform in
    ``[0, min(CONFLICT_CAP_S, CONFLICT_BASE_S * 2**retry)]``."""
    return random.uniform(0.0, min(CONFLICT_CAP_S, CONFLICT_BASE_S * 2 ** min(retry, 30)))


OnOutput = Callable[[str, bytes], Awaitable[None] | None]
"""Called with ``("stdout" | "stderr", chunk)`` for each piece of a command's live output."""


class Workspace:
    """One workspace. Methods mirror the ops of the wire contract (``docs/contract.md``)."""

    def __init__(self, client: Quill, tenant: str, name: str) -> None:
        self.client = client
        self.tenant, self.name = tenant, name
        self._key = f"{tenant}/{name}"

    @property
    def last_version(self) -> int:
        """The highest version of this workspace the client has seen (read-your-writes)."""
        return self.client._seen.get(self._key, 0)

    @last_version.setter
    def last_version(self, version: int) -> None:
        seen = self.client._seen
        seen[self._key] = version
        seen.move_to_end(self._key)
        if len(seen) > SDK_WORKSPACES:  # the least recently seen is forgotten
            seen.popitem(last=False)

    def __repr__(self) -> str:
        return f"Workspace({self.tenant}/{self.name}, seen v{self.last_version})"

    async def call(self, body: rq.Request) -> Any:
        """Send any op's request (``body``'s type names the op: ``contracts/ops.py``) as its
        method would, and return the registry's result type; what ``quill call`` uses.

        Raises:
            QuillError: as the op's method.
        """
        if type(body) not in ops.BY_REQUEST:
            raise QuillError(ErrorCode.INVALID_ARGUMENT, f"Not an op's request: {body!r}")
        if isinstance(body, rq.Command):
            return await self._cmd(body)
        if isinstance(body, rq.Query):
            return await self._qry(body)
        if isinstance(body, rq.Execution):
            return await self._exec(body, body.timeout_ms, None)
        return (await self.client.send(self.tenant, self.name, body))[1]

    # The op a request is sent as, and the type its result decodes to, come from the
    # registry (``contracts/ops.py``), by the request's type; the methods below only say how
    # their arguments make the request.
    async def _cmd(self, body: rq.Command, *, wait_ms: int | None = None) -> Any:
        with self._parked():
            version, result = await self.client.send(self.tenant, self.name, body, wait_ms=wait_ms)
        self.last_version = max(self.last_version, version or 0)
        return result

    @contextlib.contextmanager
    def _parked(self) -> Iterator[None]:
        """A request parked for approval (``APPROVAL_REQUIRED``) makes a version (its
        ``approval_requested`` event): later queries (``approval``) read as of it."""
        try:
            yield
        except QuillError as exc:
            version = (
                exc.details.get("version") if exc.code == ErrorCode.APPROVAL_REQUIRED else None
            )
            if isinstance(version, int):
                self.last_version = max(self.last_version, version)
            raise

    async def _qry(self, body: rq.Query) -> Any:
        return (await self._qry_at(body))[1]

    async def _qry_at(self, body: rq.Query) -> tuple[int, Any]:
        """The result and the workspace version it was answered at."""
        if body.min_version is None and body.version is None and self.last_version:
            body = msgspec.structs.replace(body, min_version=self.last_version)
        version, result = await self.client.send(self.tenant, self.name, body)
        if body.version is None:
            self.last_version = max(self.last_version, version or 0)
        return version or 0, result

    # ------------------------------------------------------------------ commands
    async def create(
        self,
        *,
        trust: Literal["full", "restricted"] = "full",
        limits: LimitsPatch | None = None,
        exist_ok: bool = False,
    ) -> rp.WorkspaceCreatedResult:
        body = rq.CreateWorkspace(trust=trust, limits=limits, exist_ok=exist_ok)
        return await self._cmd(body)

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        mode: Literal["overwrite", "create", "append"] = "overwrite",
        if_match: str | None = None,
        expected_version: int | None = None,
        create_parents: bool = True,
    ) -> rp.FileWritten:
        """Write ``path`` (the writer checks the workspace's ``max_file_bytes``).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` before anything is sent for content over
                ``CEILINGS.max_file_bytes``, the largest file any workspace takes; as the
                writer answers otherwise.
        """
        check_size(content)
        text, data = (content, None) if isinstance(content, str) else (None, content)
        body = rq.WriteFile(
            path=path,
            content=text,
            data=data,
            mode=mode,
            if_match=if_match,
            expected_version=expected_version,
            create_parents=create_parents,
        )
        return await self._cmd(body)

    async def mkdir(self, path: str) -> rp.DirectoryMade:
        return await self._cmd(rq.MakeDirectory(path=path))

    async def delete(
        self,
        path: str,
        *,
        recursive: bool = False,
        if_match: str | None = None,
        missing_ok: bool = False,
    ) -> rp.PathDeleted:
        body = rq.DeletePath(
            path=path, recursive=recursive, if_match=if_match, missing_ok=missing_ok
        )
        return await self._cmd(body)

    async def move(
        self, path: str, to: str, *, overwrite: bool = False, if_match: str | None = None
    ) -> rp.PathMoved:
        body = rq.MovePath(path=path, to=to, overwrite=overwrite, if_match=if_match)
        return await self._cmd(body)

    async def apply(
        self,
        changes: Sequence[rq.ApplyItem],
        *,
        base_version: int | None = None,
        on_conflict: Literal["fail", "skip"] = "fail",
        message: str | None = None,
    ) -> rp.ChangesApplied:
        """Commit several changes as one event (``base_version`` defaults to the last seen)."""
        body = rq.ApplyChanges(
            base_version=base_version or self.last_version or 1,
            changes=list(changes),
            on_conflict=on_conflict,
            message=message,
        )
        return await self._cmd(body)

    async def edit(
        self,
        path: str,
        old_string: str,
        new_string: str,
        *,
        replace_all: bool = False,
        if_match: str | None = None,
        expected_version: int | None = None,
    ) -> rp.FileEdited:
        body = rq.EditFile(
            path=path,
            old_string=old_string,
            new_string=new_string,
            replace_all=replace_all,
            if_match=if_match,
            expected_version=expected_version,
        )
        return await self._cmd(body)

    async def modify(
        self,
        path: str,
        operations: Sequence[rq.ModifyOperation],
        *,
        if_match: str | None = None,
        expected_version: int | None = None,
    ) -> rp.FileModified:
        body = rq.ModifyFile(
            path=path,
            operations=list(operations),
            if_match=if_match,
            expected_version=expected_version,
        )
        return await self._cmd(body)

    async def update(
        self,
        path: str,
        change: Callable[[str], str | Awaitable[str]],
        *,
        retries: int | None = None,
    ) -> rp.FileWritten:
        """Read the text of ``path``, write ``change(text)`` back with ``if_match`` (the etag
        read), and on ``CONFLICT`` (someone wrote the file in between) read and change again,
        up to ``retries`` times (default: the client's ``conflict_retries``) with a jittered
        backoff (``Quill.retry_conflicts``). Changes that do not depend on each other need
        none of this: ``write(mode="append")`` and ``edit`` without ``if_match`` are decided
        by the writer, in order, against the file as it is.

        Raises:
            QuillError: ``CONFLICT`` when the last attempt conflicted; as ``read_text`` and
                ``write`` otherwise.
        """

        async def attempt() -> rp.FileWritten:
            first = await self.read(path)
            if first.kind == "file" and first.content is not None and not first.truncated:
                text = first.content
            else:  # a long file (or an error to raise): read whole; if it changed since
                text = await self.read_text(path)  # ``first``, its etag makes a CONFLICT
            new = change(text)
            if inspect.isawaitable(new):
                new = await new
            return await self.write(path, new, if_match=first.etag)

        return await self.client.retry_conflicts(attempt, retries=retries)

    # ------------------------------------------------------------------ runs, locks, trust
    @contextlib.asynccontextmanager
    async def run(
        self, run: str | None = None, *, version: int | None = None
    ) -> AsyncIterator[Run]:
        """An agent run (RFC 0059 §D): inside ``async with ws.run() as run:``, what ``run``
        reads is the workspace as of the version the run started at, whatever is written
        meanwhile (by the run itself included); ``run.run()`` dispatches a sub-run reading
        the same version."""
        async with self._run(run, None, version) as handle:
            yield handle

    @contextlib.asynccontextmanager
    async def _run(
        self, run: str | None, parent: str | None, version: int | None
    ) -> AsyncIterator[Run]:
        info = await self.start_run(run, parent=parent, version=version)
        client = self.client
        view = client.as_actor(client.actor, session=client.session, run=info.run)
        handle = Run(view, self.tenant, self.name, info)
        try:
            yield handle
        finally:
            await self.end_run(info.run)

    async def start_run(
        self, run: str | None = None, *, parent: str | None = None, version: int | None = None
    ) -> rp.RunInfo:
        body = rq.RunStart(run=run, parent=parent, version=version)
        return await self._cmd(body)

    async def end_run(self, run: str) -> rp.RunInfo:
        return await self._cmd(rq.RunEnd(run=run))

    async def run_info(self, run: str) -> rp.RunInfo:
        return await self._qry(rq.RunQuery(run=run))

    async def lock(self, *, ttl_ms: int = 60_000, wait_ms: int | None = None) -> rp.LockInfo:
        """Hold the workspace for this client's session (``Quill(session=...)``); if another
        session holds it, wait up to ``wait_ms`` (default: the client's ``wait_ms``)."""
        return await self._cmd(rq.Lock(ttl_ms=ttl_ms), wait_ms=wait_ms)

    async def unlock(self) -> rp.LockInfo:
        return await self._cmd(rq.Unlock())

    async def set_trust(
        self, trust: Literal["full", "restricted"], *, commands: bool = False
    ) -> rp.TrustInfo:
        """Make the workspace ``full`` or ``restricted`` (every mutation then waits for
        approval; ``commands``: offer exec, each approved first)."""
        body = rq.SetTrust(trust=trust, commands=commands)
        return await self._cmd(body)

    async def approvals(self) -> rp.ApprovalList:
        return await self._qry(rq.ApprovalsQuery())

    async def approval(self, approval_id: str) -> rp.ApprovalStatus:
        """Approval ``approval_id`` (from an ``APPROVAL_REQUIRED`` error's details): ``pending``,
        ``approved`` (with ``outcome``, what Quill's carrying it out gave, once ``done``),
        ``denied`` or ``expired``.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when the workspace has no such approval.
        """
        status: rp.ApprovalStatus = await self._qry(rq.ApprovalQuery(approval_id=approval_id))
        if status.outcome is not None and status.outcome.version is not None:
            # what it committed is read back as with one's own writes (read-your-writes)
            self.last_version = max(self.last_version, status.outcome.version)
        return status

    async def wait_approval(self, approval_id: str, timeout: float = 60.0) -> rp.ApprovalStatus:
        """``approval(approval_id)`` once it is ``done`` (denied, expired, or approved and
        carried out), or as it stands after ``timeout`` seconds (``done`` false). Asks again
        at growing intervals (up to 2 s): the outcome is kept, so a client that went away
        can ask later.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when the workspace has no such approval.
        """
        start = time.monotonic()
        deadline = start + max(0.0, timeout)
        pause = 0.05
        while True:
            try:
                status = await self.approval(approval_id)
            except QuillError as exc:  # a replica a moment behind the writer: ask again
                behind = exc.code == ErrorCode.FILE_NOT_FOUND and time.monotonic() - start < 2
                if not behind or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(pause)
                continue
            left = deadline - time.monotonic()
            if status.done or left <= 0:
                return status
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 2.0)

    async def approve(self, approval_id: str, reason: str | None = None) -> rp.ApprovalResult:
        body = rq.Decide(approval_id=approval_id, approve=True, reason=reason)
        return await self._cmd(body)

    async def deny(self, approval_id: str, reason: str | None = None) -> rp.ApprovalResult:
        body = rq.Decide(approval_id=approval_id, approve=False, reason=reason)
        return await self._cmd(body)

    async def request_approval(
        self,
        op: str,
        summary: str,
        *,
        request_id: str | None = None,
        wait_ms: int | None = None,
        digest: str | None = None,
    ) -> rp.ApprovalResult:
        """Ask for the approval a restricted workspace needs before ``op`` (``exec.run``,
        ``exec.git``) is done outside the writer; returns once it is decided (what executors
        do before running a command there).

        Raises:
            QuillError: ``DENIED`` when denied; ``APPROVAL_REQUIRED`` while undecided past
                ``wait_ms``.
        """
        body = rq.RequestApproval(op=op, summary=summary[:4096], digest=digest)
        version, result = await self.client.send(
            self.tenant, self.name, body, request_id=request_id, wait_ms=wait_ms
        )
        self.last_version = max(self.last_version, version or 0)
        return result

    async def archive(self, reason: str | None = None) -> rp.ArchiveInfo:
        """Archive the workspace: every later command is refused (``WORKSPACE_ARCHIVED``)
        until ``unarchive``; reads and history still work."""
        return await self._cmd(rq.ArchiveWorkspace(reason=reason))

    async def unarchive(self) -> rp.ArchiveInfo:
        return await self._cmd(rq.UnarchiveWorkspace())

    async def purge(self, *, expected_version: int | None = None) -> rp.Purged:
        """Delete the workspace for good: its log, kept output, every replica's projection
        and executor's checkout of it (``expected_version``: only if nothing changed it since,
        e.g. since an export). Its name may then be created again, at version 1."""
        body = rq.PurgeWorkspace(confirm=self._key, expected_version=expected_version)
        result: rp.Purged = await self._cmd(body)
        self.last_version = 0
        return result

    async def restore(self, version: int, path: str | None = None) -> rp.Restored:
        return await self._cmd(rq.RestorePath(version=version, path=path))

    # ------------------------------------------------------------------ queries
    async def read(
        self,
        path: str,
        *,
        offset: int | None = None,
        limit: int | None = None,
        head: int | None = None,
        tail: int | None = None,
        line_numbers: bool = False,
        char_offset: int = 0,
        version: int | None = None,
    ) -> rp.FileContent:
        """One read of ``path``: the lines asked for (all, ``head``, ``tail``, or ``offset``/
        ``limit``), up to the read limits. A read limit may return less than asked: then
        ``truncated`` is true and ``cut`` names what is left out and the read that returns it
        (``read_text`` reads a whole file)."""
        body = rq.ReadFile(
            path=path,
            offset=offset,
            limit=limit,
            head=head,
            tail=tail,
            line_numbers=line_numbers,
            char_offset=char_offset,
            version=version,
        )
        return await self._qry(body)

    async def read_text(self, path: str, *, version: int | None = None) -> str:
        """The whole text of a file, however long (files are at most ``max_file_bytes``):
        past the read limits, the rest is fetched chunk by chunk at the same version.

        Raises:
            QuillError: ``NOT_A_FILE`` for a directory, ``INVALID_ENCODING`` for a binary
                file, or the read's error.
        """
        body = rq.ReadFile(path=path, version=version)
        at, result = await self._qry_at(body)
        if result.kind != "file":
            raise QuillError(ErrorCode.NOT_A_FILE, f"Not a file: {path}", {"path": path})
        if result.content is None:
            raise QuillError(
                ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding", {"path": path}
            )
        if not result.truncated:
            return result.content
        shown = result.content.encode()  # the file's first bytes: the rest follows them
        rest = await self._bytes_from(path, len(shown), version or at)
        try:
            return (shown + rest).decode("utf-8")
        except UnicodeDecodeError:  # not the same file: it changed between the two reads
            raise QuillError(
                ErrorCode.INVALID_ENCODING, "File contains invalid UTF-8 encoding", {"path": path}
            ) from None

    async def read_bytes(self, path: str, *, version: int | None = None) -> bytes:
        """The whole content of any file, fetched chunk by chunk at one version."""
        return await self._bytes_from(path, 0, version)

    async def _bytes_from(self, path: str, offset: int, version: int | None) -> bytes:
        """The bytes of ``path`` from ``offset`` to its end, chunk by chunk at one version
        (``version``, or the first chunk's)."""
        chunks: list[bytes] = []
        pinned = version
        while True:
            body = rq.ReadBytes(path=path, offset=offset, version=pinned)
            at, chunk = await self._qry_at(body)
            pinned = pinned or at
            chunks.append(chunk.data)
            offset += len(chunk.data)
            if not chunk.truncated or not chunk.data:
                return b"".join(chunks)

    async def list(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        kind: Literal["file", "directory", "any"] = "any",
        prefix: str = "",
        after: str | None = None,
        limit: int | None = None,
        version: int | None = None,
    ) -> rp.Listing:
        """One page of a directory's entries (``recursive``: everything beneath it, by path);
        pass the result's ``next`` as ``after`` for the next page, or use ``list_all``."""
        return (await self._list(path, recursive, kind, prefix, after, limit, version))[1]

    async def list_all(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        kind: Literal["file", "directory", "any"] = "any",
        prefix: str = "",
        after: str | None = None,
        version: int | None = None,
    ) -> AsyncIterator[rp.Entry]:
        """Every entry (after ``after``), page after page, all as of one version (the first
        page's, unless ``version`` is given), so that writes meanwhile do not shift pages."""
        while True:
            at, page = await self._list(path, recursive, kind, prefix, after, None, version)
            for e in page.entries:
                yield e
            if page.next is None:
                return
            after, version = page.next, version or at

    async def _list(
        self,
        path: str,
        recursive: bool,
        kind: Literal["file", "directory", "any"],
        prefix: str,
        after: str | None,
        limit: int | None,
        version: int | None,
    ) -> tuple[int, rp.Listing]:
        body = rq.ListDirectory(
            path=path,
            recursive=recursive,
            kind=kind,
            prefix=prefix,
            after=after,
            limit=limit,
            version=version,
        )
        return await self._qry_at(body)

    async def stat(self, path: str = ".", *, version: int | None = None) -> rp.FileInfo:
        return await self._qry(rq.StatPath(path=path, version=version))

    async def glob(
        self,
        pattern: str,
        path: str = ".",
        *,
        kind: Literal["file", "directory", "any"] = "any",
        max_results: int | None = None,
        exclude: Sequence[str] | None = None,
        version: int | None = None,
    ) -> rp.Matches:
        body = rq.GlobQuery(
            pattern=pattern,
            path=path,
            kind=kind,
            max_results=max_results,
            exclude=None if exclude is None else list(exclude),
            version=version,
        )
        return await self._qry(body)

    async def grep(
        self,
        pattern: str,
        path: str = ".",
        *,
        literal: bool = False,
        ignore_case: bool = False,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        context_lines: int = 0,
        max_results: int | None = None,
        version: int | None = None,
    ) -> rp.GrepResult:
        body = rq.GrepQuery(
            pattern=pattern,
            path=path,
            literal=literal,
            ignore_case=ignore_case,
            include=None if include is None else list(include),
            exclude=None if exclude is None else list(exclude),
            context_lines=context_lines,
            max_results=max_results,
            version=version,
        )
        return await self._qry(body)

    async def explore(
        self,
        path: str = ".",
        *,
        recursive: bool = False,
        max_depth: int = 3,
        exclude: Sequence[str] | None = None,
        metadata: bool = False,
        max_results: int | None = None,
        version: int | None = None,
    ) -> rp.Tree:
        body = rq.ExploreQuery(
            path=path,
            recursive=recursive,
            max_depth=max_depth,
            exclude=None if exclude is None else list(exclude),
            metadata=metadata,
            max_results=max_results,
            version=version,
        )
        return await self._qry(body)

    async def diff(
        self,
        from_version: int,
        to_version: int | None = None,
        path: str | None = None,
        *,
        context_lines: int = 3,
    ) -> rp.Diff:
        body = rq.DiffQuery(
            from_version=from_version,
            to_version=to_version,
            path=path,
            context_lines=context_lines,
        )
        return await self._qry(body)

    # ------------------------------------------------------------------ exec
    async def exec(
        self,
        command: str,
        *,
        workdir: str = "",
        timeout_ms: int | None = None,
        env: Mapping[str, str] | None = None,
        version: int | None = None,
        on_output: OnOutput | None = None,
        stdin: bytes | None = None,
    ) -> rp.CommandResult:
        """Run ``command`` (``bash -c``) in the workspace's sandbox; the files it changes are
        committed as one event. ``on_output`` receives its output live; ``stdin`` is its
        standard input, given whole (default: closed).

        Raises:
            QuillError: ``SIZE_LIMIT_EXCEEDED`` for a ``stdin`` over
                ``limits.EXEC_STDIN_MAX_BYTES`` (not sent); what ``exec.run`` answers.
        """
        check_stdin(stdin)
        body = rq.RunCommand(
            command=command,
            workdir=workdir,
            timeout_ms=timeout_ms,
            env=dict(env) if env is not None else None,
            version=version,
            min_version=self.last_version or None if version is None else None,
            stdin=stdin,
        )
        return await self._exec(body, timeout_ms, on_output)

    async def git(
        self,
        action: rq.GitAction,
        *,
        workdir: str = "",
        message: str | None = None,
        files: Sequence[str] | None = None,
        branch: str | None = None,
        remote: str = "origin",
        url: str | None = None,
        path: str | None = None,
        limit: int = 20,
        timeout_ms: int | None = None,
    ) -> rp.GitResult:
        """A git action on the repository at ``workdir`` (``.git`` is in the workspace)."""
        body = rq.GitCommand(
            action=action,
            workdir=workdir,
            message=message,
            files=list(files) if files is not None else None,
            branch=branch,
            remote=remote,
            url=url,
            path=path,
            limit=limit,
            timeout_ms=timeout_ms,
            min_version=self.last_version or None,
        )
        return await self._exec(body, timeout_ms, None)

    async def command_output(
        self,
        command_id: str,
        *,
        stream: rq.OutputStream = "stdout",
        offset: int = 0,
        length: int = 64 * 1024,
    ) -> rp.CommandOutput:
        """A page of a command's whole output (``exec.output``), kept for a while (an hour
        by default) after it ended: ``length`` bytes from byte ``offset`` of ``stream``. A
        long output's reply (``exec``) shows its head and tail; the middle is
        ``stdout_omitted_bytes`` from ``stdout_omitted_offset``. Page on with
        ``offset + page.length`` while ``page.more``.

        Raises:
            QuillError: ``FILE_NOT_FOUND`` when nothing is kept under ``command_id`` for this
                workspace (another workspace's command, or too old).
        """
        body = rq.CommandOutputQuery(
            command_id=command_id, stream=stream, offset=offset, length=length
        )
        return (await self.client.send(self.tenant, self.name, body))[1]

    async def _exec(
        self, body: rq.Execution, timeout_ms: int | None, on_output: OnOutput | None
    ) -> Any:
        client, spec = self.client, ops.of_request(body)
        request_id = client._nuid.next().decode()
        heard = time.monotonic()
        eof = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            nonlocal heard
            heard = time.monotonic()
            stream = (msg.headers or {}).get(HEADER_STREAM)
            if stream == "eof":
                eof.set()
            elif on_output is not None and stream in ("stdout", "stderr"):
                done = on_output(stream, msg.data)
                if inspect.isawaitable(done):
                    await done

        subject = client.subjects.execout(self.tenant, self.name, request_id)
        sub = await client.nc.subscribe(subject, cb=on_msg)
        try:
            with self._parked():
                version, result = await client.exec_request(
                    self.tenant,
                    self.name,
                    spec.name,
                    body,
                    spec.result,
                    request_id=request_id,
                    deadline_s=(timeout_ms or 600_000) / 1000 + 600,
                    heard=lambda: heard,
                )
            if on_output is not None:  # the reply may overtake the last of the output
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(eof.wait(), 5)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.last_version = max(self.last_version, version or 0)
        return result

    async def history(
        self,
        path: str | None = None,
        *,
        limit: int = 100,
        before: int | None = None,
        follow: bool = False,
    ) -> rp.HistoryPage:
        """Revisions of ``path`` (or the workspace's events), newest first; ``follow``: across
        the moves that brought the file to ``path`` (page on with ``before`` and the page's
        ``next_path``)."""
        body = rq.History(path=path, limit=limit, before=before, follow=follow)
        return await self._qry(body)

    async def info(self, *, version: int | None = None) -> rp.WorkspaceInfo:
        body = rq.WorkspaceInfoQuery(version=version)
        return await self._qry(body)

    async def events(self, *, after: int = 0, limit: int = 100) -> rp.EventPage:
        body = rq.EventsQuery(after=after, limit=limit)
        return await self._qry(body)

    async def tree(
        self,
        *,
        after: str | None = None,
        limit: int = 1000,
        contents: bool = True,
        version: int | None = None,
    ) -> rp.TreePage:
        """One page of the whole tree as of ``version`` (default: the replica's latest, which
        the first page's ``head`` names: pass it as ``version`` with ``after`` for the rest)."""
        body = rq.TreeQuery(after=after, limit=limit, contents=contents, version=version)
        return await self._qry(body)

    # ------------------------------------------------------------------ streams
    async def watch(self, *, wait: bool = False) -> AsyncIterator[WorkspaceUpdated]:
        """``workspace.updated`` notifications, as they are published.

        A workspace that does not exist fails like every other call on it, once the
        subscription is confirmed (nothing created meanwhile is missed); with ``wait``, the
        watch waits for it instead: its creation is the first notification.

        Raises:
            QuillError: ``WORKSPACE_NOT_FOUND`` (without ``wait``), ``ACCESS_DENIED`` when the
                server refuses the subscription (another tenant's workspace), ``UNAVAILABLE``
                if it cannot be confirmed.
        """
        nc = self.client.nc
        subject = self.client.subjects.updated(self.tenant, self.name)
        sub = await nc.subscribe(subject)
        try:
            # The server answers a refused SUB with -ERR, and the client records it
            # (connection.refused) as it reads it: nothing would ever arrive. The -ERR may come
            # after the PONG of the first round trip (seen with nats-server 2.15), never after the
            # second's.
            for _ in range(2):
                await nc.flush(timeout=max(1, int(self.client.timeout)))
        except (nats.errors.Error, TimeoutError) as exc:
            await sub.unsubscribe()
            raise QuillError(ErrorCode.UNAVAILABLE, f"NATS: {exc}") from None
        if connection.refused(nc, subject):
            await sub.unsubscribe()
            raise _refused(subject)
        try:
            if not wait:
                await self.stat(".")  # WORKSPACE_NOT_FOUND, as any call on it answers
            async for msg in sub.messages:
                yield codec.decode(msg.data, WorkspaceUpdated)
        finally:
            await sub.unsubscribe()

    async def audit(
        self, *, since: datetime | None = None, follow: bool = False
    ) -> AsyncIterator[AuditRecord]:
        """Audit records from WS_AUDIT (oldest first); with ``follow``, keep waiting."""
        js = self.client.nc.jetstream()
        subject = self.client.subjects.audit(self.tenant, self.name)
        try:
            info = await js.stream_info(STREAM_AUDIT, subjects_filter=subject)
        except nats.errors.TimeoutError:
            raise QuillError(
                ErrorCode.UNAVAILABLE,
                f"JetStream did not answer about {STREAM_AUDIT} (a tenant's credentials may "
                "not read audit history: see docs/operations.md, Tenants)",
            ) from None
        if not follow and not (info.state.subjects or {}).get(subject):
            return
        config = (
            ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
            if since
            else ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        )
        sub = await js.subscribe(subject, ordered_consumer=True, config=config)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=None if follow else 2.0)
                except nats.errors.TimeoutError:
                    return
                yield codec.decode(msg.data, AuditRecord)
                if not follow and msg.metadata.num_pending == 0:
                    return
        finally:
            await sub.unsubscribe()


class Run(Workspace):
    """A workspace as one agent run sees it: every request carries ``Ws-Run``, and queries
    read the version the run is pinned to (``started.version``)."""

    def __init__(self, client: Quill, tenant: str, name: str, started: rp.RunInfo) -> None:
        super().__init__(client, tenant, name)
        self.started = started
        self.id = started.run

    @contextlib.asynccontextmanager
    async def run(
        self, run: str | None = None, *, version: int | None = None
    ) -> AsyncIterator[Run]:
        """A sub-run of this run (a dispatched agent): same workspace, same version unless
        ``version`` says otherwise."""
        async with self._run(run, self.id, version) as handle:
            yield handle
