"""Entry point of a bridge: a request for its workspace → the answer from the folder.

Requests are parsed, refused and audited exactly as the services do (``infra.entry``,
one audit record per operation, ``service: "bridge"``). Queries are answered at once, each in a
thread. Mutations and commands pass a gate in arrival order: a mutation is decided first (a
refused one is answered without asking anybody), then approved (``approvals``), then decided
again and applied while the gate is held, so mutations happen one at a time and in order;
a command is approved while the gate is held and runs after it. A command retried with the
same request id (the SDK does so after 10 s without a reply, as when its approval is slow)
joins the one in progress, and one that succeeded gets its first reply again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from contracts import codec
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.events import AnyChange, WorkspaceUpdated
from contracts.limits import BRIDGE_MAX_INFLIGHT, RETRY_AFTER_MS
from contracts.subjects import Address, Origin, Subjects, new_request_id
from infra.blobs import Blobs
from infra.bus import respond
from infra.busy import refused
from infra.entry import Incoming, parse, reject, reply_headers
from infra.exec.answer import Job, answer_exec, received
from infra.exec.git import READ_ONLY_GIT
from infra.exec.results import audited
from infra.runtime import Auditor
from services.bridge.approvals import Approver, asking, describe
from services.bridge.changes import LocalChanges
from services.bridge.commands import LocalCommands
from services.bridge.folder import Folder
from services.bridge.queries import COMMANDS, NOT_KEPT, LocalQueries, not_kept

log = logging.getLogger("quill.bridge")

REMEMBERED = 10_000
"""Successful command replies kept by request id (a retry gets the first reply)."""


@dataclass
class Local:
    """What one bridge serves, and how."""

    tenant: str
    workspace: str
    uri: str
    folder: Folder
    queries: LocalQueries
    changes: LocalChanges
    commands: LocalCommands
    approver: Approver


class Handlers:
    """The message handlers of one bridge; ``stop`` cancels what is in progress."""

    def __init__(self, nc: NATS, subjects: Subjects, auditor: Auditor, local: Local) -> None:
        self.nc, self.subjects, self.auditor, self.local = nc, subjects, auditor, local
        self.blobs = Blobs(nc.jetstream()).of(local.tenant, local.workspace)
        self.gate = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending: dict[str, list[Msg]] = {}
        self.done: OrderedDict[str, bytes] = OrderedDict()

    def _spawn(self, answer: Callable[[Incoming], Any]) -> Callable[[Msg], Any]:
        async def on_msg(msg: Msg) -> None:
            if len(self.tasks) >= BRIDGE_MAX_INFLIGHT:
                error = refused(
                    "bridge", "requests", "The bridge", RETRY_AFTER_MS, limit=BRIDGE_MAX_INFLIGHT
                )
                await reject(Incoming(msg), error, self.auditor)
                return
            task = asyncio.create_task(answer(Incoming(msg)))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        return on_msg

    def on_query(self) -> Callable[[Msg], Any]:
        return self._spawn(self.query)

    def on_command(self) -> Callable[[Msg], Any]:
        return self._spawn(self.command)

    def on_exec(self) -> Callable[[Msg], Any]:
        return self._spawn(self.execute)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=10)

    # ------------------------------------------------------------------ queries
    async def query(self, incoming: Incoming) -> None:
        local = self.local
        try:
            address, spec, origin, request = parse(incoming, self.subjects, "qry")
            if spec.name in NOT_KEPT:
                raise not_kept("History", local.uri)
            answer = local.queries.ops().get(spec.name)
            if answer is None:
                raise _unavailable(spec.name, local.uri)
            assert isinstance(request, rq.Query)
            local.queries.check_version(request)
            version = local.folder.version
            result = await asyncio.to_thread(answer, request)
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        except asyncio.CancelledError:
            await reject(incoming, _stopping(), self.auditor)
            raise
        except Exception as exc:
            await reject(incoming, _internal(incoming, exc), self.auditor)
            return
        await respond(incoming.msg, codec.ok_reply(version, result), reply_headers(origin))
        path = getattr(request, "path", None)
        await self.auditor.record(
            address, origin, incoming.started, version=version, paths=[path] if path else []
        )

    # ------------------------------------------------------------------ commands
    async def command(self, incoming: Incoming) -> None:
        try:
            address, spec, origin, request = parse(
                incoming, self.subjects, "cmd", new_id=new_request_id
            )
        except QuillError as exc:
            await reject(incoming, exc, self.auditor)
            return
        rid = origin.request_id
        replayed = self.done.get(rid)
        if replayed is not None:  # a retry of a command done: its first reply
            await respond(incoming.msg, replayed, reply_headers(origin))
            return
        waiting = self.pending.get(rid)
        if waiting is not None:  # a retry of a command in progress: answered with it
            waiting.append(incoming.msg)
            return
        self.pending[rid] = [incoming.msg]
        error: QuillError | None = None
        reply = b""
        version = self.local.folder.version
        paths: list[str] = []
        details: dict[str, Any] = {}
        try:
            version, result, paths, details = await self._command(spec.name, origin, request)
            reply = codec.ok_reply(version, result)
            self.done[rid] = reply
            while len(self.done) > REMEMBERED:
                self.done.popitem(last=False)
        except QuillError as exc:
            error = exc
        except asyncio.CancelledError:
            error = _stopping()
            raise
        except Exception as exc:
            error = _internal(incoming, exc)
        finally:
            if error is not None:
                reply = codec.error_reply(error)
            for msg in self.pending.pop(rid, []):
                await respond(msg, reply, reply_headers(origin))
            await self.auditor.record(
                address,
                origin,
                incoming.started,
                error=error,
                version=version if error is None else None,
                paths=paths,
                summary=describe(request),
                details=details or None,
            )

    async def _command(
        self, op: str, origin: Origin, request: rq.Request
    ) -> tuple[int, Any, list[str], dict[str, Any]]:
        local = self.local
        if op == "restore":
            raise not_kept("History", local.uri)
        if op not in COMMANDS:
            raise _unavailable(op, local.uri)
        async with self.gate:
            blobs = await self._blobs(request)
            decision = await asyncio.to_thread(local.changes.decide, request, blobs)
            if not decision.changes:  # nothing to change (or create): nothing to ask
                return local.folder.version, decision.result, decision.paths, {}
            how = await local.approver.approve(asking(op, request), describe(request), origin)
            decision = await asyncio.to_thread(local.changes.commit, request, blobs)
            if decision.changes:
                await self._notify(op, origin, decision.changes)
            return local.folder.version, decision.result, decision.paths, {"approval": how}

    async def _notify(self, op: str, origin: Origin, changes: list[AnyChange]) -> None:
        """``workspace.updated``, as the writer publishes it (no tree hash: no log)."""
        local = self.local
        paths = list(dict.fromkeys(c.path for c in changes))
        update = WorkspaceUpdated(
            tenant=local.tenant,
            workspace=local.workspace,
            version=local.folder.version,
            op=op,
            actor=origin.actor,
            request_id=origin.request_id,
            at=local.folder.updated,
            paths=paths[:100],
            paths_total=len(paths),
            tree_hash="",
        )
        subject = self.subjects.updated(local.tenant, local.workspace)
        try:
            await self.nc.publish(subject, codec.encode(update))
        except Exception as exc:
            log.warning("could not publish workspace.updated: %s", exc)

    async def _blobs(self, request: rq.Request) -> dict[str, bytes]:
        """Contents an ``apply`` names by sha256, in the workspace's own namespace (a missing
        one: decide refuses the apply)."""
        if not isinstance(request, rq.ApplyChanges):
            return {}
        out = {}
        for change in request.changes:
            if isinstance(change, rq.PutChange) and change.blob and change.blob not in out:
                with contextlib.suppress(QuillError):
                    if await self.blobs.has(change.blob):
                        out[change.blob] = await self.blobs.get(change.blob)
        return out

    # ------------------------------------------------------------------ exec
    async def execute(self, incoming: Incoming) -> None:
        local = self.local
        secrets = local.commands.secrets
        taken = await received(incoming, self.nc, self.subjects, self.auditor, secrets)
        if taken is None:
            return
        address, origin, request, job = taken
        details: dict[str, Any] = {"summary": describe(request)}

        async def work() -> tuple[int, rp.CommandResult | rp.GitResult]:
            result = await self._execute(address, origin, request, job, details)
            return local.folder.version, result

        await answer_exec(
            incoming, job, self.auditor, address, origin, work, details,
            stopping="The bridge is stopping; retry",
        )  # fmt: skip

    async def _execute(
        self,
        address: Address,
        origin: Origin,
        request: rq.Request,
        job: Job,
        details: dict[str, Any],
    ) -> Any:
        local = self.local
        if not isinstance(request, rq.RunCommand | rq.GitCommand):  # live commands: executors'
            raise _unavailable(f"exec.{address.op}", local.uri)
        local.queries.check_version(request)
        details["workdir"] = request.workdir
        if isinstance(request, rq.GitCommand):
            details["action"] = request.action
            local.commands.check_git(request)
            if request.action in READ_ONLY_GIT:
                return await local.commands.git(request, origin.actor)
            async with self.gate:
                details["approval"] = await local.approver.approve(
                    asking("git", request), describe(request), origin
                )
            return await local.commands.git(request, origin.actor)
        secrets = local.commands.secrets  # the command as audited and approved: redacted
        details.update(command=secrets.redact(request.command)[0][:4096])
        details.update(env=sorted(request.env or {}))
        async with self.gate:
            workdir = local.commands.workdir(request.workdir)
            details["approval"] = await local.approver.approve(
                asking("run", request), secrets.redact(describe(request))[0], origin
            )
        outcome, output, result = await local.commands.run(request, workdir, job.output)
        audited(outcome, details, output.redacted | job.redacted)
        details["changed"] = result.changes.total
        return result


def _unavailable(op: str, uri: str) -> QuillError:
    return QuillError(
        ErrorCode.INVALID_ARGUMENT,
        f"{op} is not available on a local workspace ({uri})",
        {"op": op, "uri": uri},
    )


def _stopping() -> QuillError:
    return QuillError(ErrorCode.UNAVAILABLE, "The bridge is stopping; retry")


def _internal(incoming: Incoming, exc: Exception) -> QuillError:
    log.error("%s failed", incoming.msg.subject, exc_info=exc)
    return QuillError(ErrorCode.INTERNAL, f"Internal error: {type(exc).__name__}")
