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
its body must be the approval's (ids whose ``.`` became ``_`` share a subject).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from contracts import hashing
from contracts import replies as rp
from contracts.errors import QuillError
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


_parked = msgspec.json.Decoder(Parked)
_outcome = msgspec.json.Decoder(rp.ApprovalOutcome)


async def ensure_stream(js: JetStreamContext, subjects: Subjects, replicas: int = 1) -> None:
    """Create ``WS_APPROVALS`` if missing (a create lost to another service is a success).

    Raises:
        nats.js.errors.APIError: JetStream refused it.
    """
    wanted = StreamConfig(
        name=STREAM_APPROVALS,
        description="Quill: requests parked for approval, and their outcome",
        subjects=[subjects.all_approvals],
        storage=StorageType.FILE,
        num_replicas=replicas,
        max_age=float(APPROVAL_KEEP_S),
        max_msg_size=MAX_MSG_BYTES,
        discard=DiscardPolicy.OLD,
        allow_direct=True,
    )
    try:
        info = await js.stream_info(STREAM_APPROVALS)
    except NotFoundError:
        if await assets.create_once(f"stream {STREAM_APPROVALS}", lambda: js.add_stream(wanted)):
            return
        info = await js.stream_info(STREAM_APPROVALS)
    if info.config.max_age != wanted.max_age or not info.config.allow_direct:
        await js.update_stream(
            dataclasses.replace(info.config, max_age=wanted.max_age, allow_direct=True)
        )


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

    async def record(
        self,
        tenant: str,
        workspace: str,
        approval_id: str,
        *,
        version: int | None = None,
        result: Any = None,
        error: QuillError | None = None,
    ) -> None:
        """Keep what carrying out ``approval_id`` gave (best effort: logged if refused)."""
        outcome = rp.ApprovalOutcome(
            at=datetime.now(UTC),
            version=version,
            result=msgspec.to_builtins(result) if result is not None else None,
            error=rp.ErrorBody(code=str(error.code), message=error.message, details=error.details)
            if error is not None
            else None,
        )
        subject = self.subjects.approval(tenant, workspace, approval_id, "outcome")
        try:
            await self.js.publish(subject, msgspec.json.encode(outcome))
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
