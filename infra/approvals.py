"""Requests parked for approval, kept until Quill carries them out: the stream ``WS_APPROVALS``.

A request on a restricted workspace waits for someone to decide it; its client need not wait
with it. So the service that parks it keeps it here (the writer a mutation, the executor a
command: ``request``), and once it is approved carries it out itself, as its client asked it
(same request id, actor and session, same conditions: an ``if_match`` no longer met is
refused then), and keeps what that gave (``outcome``) for anyone to read by approval id
(``qry.approval``). Subjects (``Subjects.approval``): ``ws.approval.<t>.<w>.<id>.request``,
``….claim`` (an executor took an approved command: it runs once, whoever sends it again),
``….outcome``.

Why a stream with a ``max_age`` and not the log: a parked request holds contents (and a
command's environment) that must not stay in the workspace's history if it is denied, and an
outcome is read for a while, not forever (``APPROVAL_KEEP_S``: the longest an approval may
wait, then at least an hour; command output is kept the same way, ``WS_OUTPUT``). What was
decided, and when it expires, is in the log (``approval_requested``/``approval_decided``);
what is kept here survives a restart of every service (file storage). Tenants cannot read or
write it: their NATS users have no ``$JS.API`` and publish to ``cmd``/``qry``/``exec`` only.
A kept request is carried out only if it is the one approved: its request id and the sha256 of
its body must be the approval's (ids whose ``.`` became ``_`` share a subject). What an approver
is shown of a command is derived from the request kept here (``summary``), never taken from
the client that asks (``cmd.request_approval``, which only the executors' NATS user may send).

Crashes (docs/operations.md, "Approvals and crashes"): an approval decided approved whose
outcome is not kept is carried out by the writer that next loads the workspace (at its start,
or when it takes a partition over: ``unfinished``); its request id keeps a mutation once, an
executor's claim a command. A claim whose outcome is not kept ``CLAIM_GRACE_S`` past the
command's longest run was lost with its executor: its outcome is then ``EXECUTION_FAILED``
(``lost``), and the command can be run again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy
from nats.js.errors import APIError, NotFoundError

from contracts import codec, hashing
from contracts import ops as registry
from contracts import replies as rp
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.limits import APPROVAL_KEEP_S
from contracts.subjects import STREAM_APPROVALS, Subjects
from infra import assets

log = logging.getLogger("quill.approvals")

MAX_MSG_BYTES = 8 * 1024**2
"""The largest entry (a parked request's body is bounded by the bus's payload already).

``WS_APPROVALS`` has no ``max_bytes``: a stream's ``max_bytes`` is reserved from JetStream's
storage limit, the log's room, whether used or not (a 1 GiB reservation made ``quill up`` on a
small disk refuse the executor's ``WS_OUTPUT``). What it holds is bounded by the writer (256
waiting approvals a workspace), by ``max_age`` and by the storage limit the log lives under."""
CLAIM_GRACE_S = 60.0
"""How long past its command's longest run (``max_exec_ms``) a claim may stay without an
outcome before its executor is taken for lost (its capture and commit take this at most)."""
MAX_LISTED = 100_000
"""Subjects one listing of ``WS_APPROVALS`` names at most (nats-server's page)."""


class Parked(msgspec.Struct, frozen=True, kw_only=True):
    """A request kept for when it is approved: its op (``cmd.write``, ``exec.run``), the
    ``Ws-*`` headers it came with, and its JSON body as sent (registered secrets redacted),
    kept as text (what is kept can be searched for a secret, as every stream is)."""

    op: str
    headers: dict[str, str]
    text: str

    @classmethod
    def of(cls, op: str, headers: dict[str, str], body: bytes) -> Parked:
        return cls(op=op, headers=headers, text=body.decode("utf-8", "replace"))

    @property
    def body(self) -> bytes:
        return self.text.encode()

    @property
    def digest(self) -> str:
        return digest(self.body)


def digest(body: bytes) -> str:
    """What an approval is of: the sha256 of the request's body."""
    return hashing.content_sha256(body)


def summary(parked: Parked) -> str:
    """What an approver is shown of a kept command: derived from the request that will run
    (its command line, its stdin's size; a git action), never from what its client says.

    Raises:
        QuillError: ``INVALID_ARGUMENT`` for a request of another op, or not one.
    """
    spec = registry.OPS.get(parked.op)
    if spec is None or spec.kind != "exec":
        raise QuillError(
            ErrorCode.INVALID_ARGUMENT, f"{parked.op} is not a command kept for approval"
        )
    request = codec.decode_request(spec, parked.body)
    if isinstance(request, rq.RunCommand):
        fed = f" < stdin ({len(request.stdin)} bytes)" if request.stdin is not None else ""
        return request.command + fed
    if isinstance(request, rq.GitCommand):
        return f"git {request.action}"
    return parked.op


_parked = msgspec.json.Decoder(Parked)
_outcome = msgspec.json.Decoder(rp.ApprovalOutcome)


async def ensure_stream(js: JetStreamContext, subjects: Subjects, replicas: int = 1) -> None:
    """Create ``WS_APPROVALS`` if missing (a create lost to another service is a success).

    Raises:
        nats.js.errors.APIError: JetStream refused it.
    """
    wanted = assets.file_stream(
        STREAM_APPROVALS,
        "Quill: requests parked for approval, and their outcome",
        [subjects.all_approvals],
        replicas,
        max_age=float(APPROVAL_KEEP_S),
        max_msg_size=MAX_MSG_BYTES,
        discard=DiscardPolicy.OLD,
    )
    await assets.stream(js, wanted, ("max_age", "allow_direct"))


@dataclasses.dataclass(frozen=True)
class Approvals:
    """``WS_APPROVALS`` for one service."""

    js: JetStreamContext
    subjects: Subjects

    async def keep(self, tenant: str, workspace: str, approval_id: str, parked: Parked) -> None:
        """Keep ``parked`` for when approval ``approval_id`` is decided."""
        subject = self.subjects.approval(tenant, workspace, approval_id, "request")
        await self.js.publish(subject, msgspec.json.encode(parked))

    async def parked(
        self, tenant: str, workspace: str, approval_id: str, digest_: str | None
    ) -> Parked | None:
        """The request kept for ``approval_id`` if it is the one approved (its request id,
        and its body's sha256 ``digest_`` when the approval names one), else None."""
        data = await self._last(tenant, workspace, approval_id, "request")
        if data is None:
            return None
        try:
            kept = _parked.decode(data)
        except msgspec.DecodeError:
            return None
        if kept.headers.get("Ws-Request-Id") != approval_id:
            return None
        if digest_ is not None and kept.digest != digest_:
            return None
        return kept

    async def claim(self, tenant: str, workspace: str, approval_id: str, by: str) -> bool:
        """Take the carrying out of ``approval_id`` (False: someone took it already)."""
        subject = self.subjects.approval(tenant, workspace, approval_id, "claim")
        try:
            await self.js.publish(
                subject, by.encode(), headers={"Nats-Expected-Last-Subject-Sequence": "0"}
            )
        except APIError as exc:
            if exc.err_code == 10071:  # wrong last sequence: claimed already
                return False
            raise
        return True

    async def claimed(self, tenant: str, workspace: str, approval_id: str) -> datetime | None:
        """When ``approval_id`` was claimed (None: not claimed)."""
        subject = self.subjects.approval(tenant, workspace, approval_id, "claim")
        try:
            msg = await self.js.get_last_msg(STREAM_APPROVALS, subject, direct=True)
        except NotFoundError:
            return None
        return _sent_at(msg.time)

    async def settled(
        self, nc: NATS, tenant: str, workspace: str, approval_id: str, within_s: float
    ) -> rp.ApprovalOutcome | QuillError | None:
        """What came of ``approval_id``, claimed by an executor: its outcome once kept, or,
        when none is kept by ``within_s`` (its command's longest run) and ``CLAIM_GRACE_S``
        after the claim, the error kept for an executor lost; None when it is not claimed."""
        at = await self.claimed(tenant, workspace, approval_id)
        if at is None:
            return await self.outcome(tenant, workspace, approval_id)
        deadline = at + timedelta(seconds=within_s + CLAIM_GRACE_S)
        wait_s = max(0.0, (deadline - datetime.now(UTC)).total_seconds())
        outcome = await self.wait_outcome(nc, tenant, workspace, approval_id, wait_s)
        return outcome if outcome is not None else await self.lost(tenant, workspace, approval_id)

    async def lost(self, tenant: str, workspace: str, approval_id: str) -> QuillError:
        """Keep ``EXECUTION_FAILED`` as the outcome of ``approval_id``, claimed by an executor
        that stopped before it kept one (unless one was kept meanwhile: that one stays)."""
        error = QuillError(
            ErrorCode.EXECUTION_FAILED,
            f"The executor that ran approved command {approval_id} stopped before it "
            "finished (executor lost): what it changed was not committed; run it again",
            {"approval_id": approval_id, "lost": True},
        )
        await self.record(tenant, workspace, approval_id, error=error, first=True)
        return error

    async def unfinished(
        self, tenant: str | None = None, workspace: str | None = None
    ) -> dict[tuple[str, str], set[str]]:
        """The requests kept without an outcome, by workspace: ``{(tenant, workspace): {id
        token}}`` (an id's ``.`` is ``_`` in its token). All of them, or one workspace's."""
        base = f"{self.subjects.root}.approval"
        where = f"{tenant}.{workspace}" if tenant and workspace else "*.*"
        found: dict[tuple[str, str], set[str]] = {}
        listed = {}
        for part in ("request", "outcome"):
            try:
                info = await self.js.stream_info(
                    STREAM_APPROVALS, subjects_filter=f"{base}.{where}.*.{part}"
                )
            except NotFoundError:
                return found
            listed[part] = set(info.state.subjects or {})
            if len(listed[part]) >= MAX_LISTED:
                log.warning("%s: more than %d %s subjects: some are not looked at",
                            STREAM_APPROVALS, MAX_LISTED, part)  # fmt: skip
        for subject in listed["request"]:
            if subject.removesuffix("request") + "outcome" in listed["outcome"]:
                continue
            tokens = subject.split(".")
            if len(tokens) == 6:
                found.setdefault((tokens[2], tokens[3]), set()).add(tokens[4])
        return found

    async def record(
        self,
        tenant: str,
        workspace: str,
        approval_id: str,
        *,
        version: int | None = None,
        result: Any = None,
        error: QuillError | None = None,
        first: bool = False,
    ) -> None:
        """Keep what carrying out ``approval_id`` gave (best effort: logged if refused);
        ``first``: unless an outcome is kept already."""
        outcome = rp.ApprovalOutcome(
            at=datetime.now(UTC),
            version=version,
            result=msgspec.to_builtins(result) if result is not None else None,
            error=rp.ErrorBody(code=str(error.code), message=error.message, details=error.details)
            if error is not None
            else None,
        )
        subject = self.subjects.approval(tenant, workspace, approval_id, "outcome")
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"} if first else None
        try:
            await self.js.publish(subject, msgspec.json.encode(outcome), headers=headers)
        except APIError as exc:
            if not (first and exc.err_code == 10071):  # kept already: that one stays
                log.warning("%s/%s: outcome of approval %s not kept: %r", tenant, workspace,
                            approval_id, exc)  # fmt: skip
        except Exception as exc:
            log.warning("%s/%s: outcome of approval %s not kept: %r", tenant, workspace,
                        approval_id, exc)  # fmt: skip

    async def outcome(
        self, tenant: str, workspace: str, approval_id: str
    ) -> rp.ApprovalOutcome | None:
        data = await self._last(tenant, workspace, approval_id, "outcome")
        return _outcome.decode(data) if data is not None else None

    async def wait_outcome(
        self, nc: NATS, tenant: str, workspace: str, approval_id: str, timeout_s: float
    ) -> rp.ApprovalOutcome | None:
        """The outcome of ``approval_id`` once it is kept (None after ``timeout_s``): for a
        client that sent an approved request again while it is being carried out."""
        subject = self.subjects.approval(tenant, workspace, approval_id, "outcome")
        kept: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            if not kept.done():
                kept.set_result(msg.data)

        sub = await nc.subscribe(subject, cb=on_msg)  # before looking: none is missed
        try:
            found = await self.outcome(tenant, workspace, approval_id)
            if found is not None:
                return found
            try:
                return _outcome.decode(await asyncio.wait_for(kept, timeout_s))
            except TimeoutError:
                return None
        finally:
            await sub.unsubscribe()

    async def purge(self, tenant: str, workspace: str) -> None:
        """Drop everything kept of ``workspace`` (it was purged)."""
        subject = self.subjects.workspace_approvals(tenant, workspace)
        try:
            await self.js.purge_stream(STREAM_APPROVALS, subject=subject)
        except NotFoundError:
            pass

    async def _last(self, tenant: str, workspace: str, approval_id: str, part: str) -> bytes | None:
        subject = self.subjects.approval(tenant, workspace, approval_id, part)
        try:
            msg = await self.js.get_last_msg(STREAM_APPROVALS, subject, direct=True)
        except NotFoundError:
            return None
        return msg.data or None


def _sent_at(when: datetime | None) -> datetime:
    """When a message was stored (a direct get's ``Nats-Time-Stamp``; now if it has none)."""
    if when is None:
        return datetime.now(UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
