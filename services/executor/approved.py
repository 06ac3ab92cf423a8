"""Whether a command may run, and a restricted workspace's command parked for approval:
``exec.run`` and ``exec.git`` refused on an archived workspace or while another session holds
its lock; on a restricted one kept (``infra/approvals.py``) and run once approved, its outcome
kept for ``qry.approval`` and for the same request sent again.

Apart from ``commands`` (which runs commands and git actions): the approval's side of a
command, the same for both, and for a command in a shell.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TypeVar

import msgspec

from contracts import codec
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from contracts.subjects import HEADER_TIMEOUT, HEADER_WAIT, Address, Origin
from core.evolve import ArchiveState, LockState
from core.secrets import Secrets
from infra import approvals
from infra.approvals import Approvals, Parked
from infra.exec.checkout import Checkout
from quill.client import Quill

R = TypeVar("R")


class Approved:
    """Approvals of the commands of one executor (see the module docstring)."""

    def __init__(self, kept: Approvals, quill: Quill, secrets: Secrets) -> None:
        self.kept, self.quill, self.secrets = kept, quill, secrets
        """``WS_APPROVALS``: commands parked for approval, and their outcome."""

    async def check(
        self,
        checkout: Checkout,
        address: Address,
        origin: Origin,
        op: str,
        req: rq.Execution,
    ) -> bool:
        """Refuse a command of another session while the workspace is locked (before it runs:
        the writer would refuse its changes); on a restricted workspace, refuse, or keep the
        command (to be run once approved, its client there or not: ``infra/approvals.py``)
        and wait for the approval of what is asked. True: it was approved, and this executor
        took it (it runs once, whoever sends it again): its outcome is to be kept.

        Raises:
            QuillError: ``DENIED``, ``APPROVAL_REQUIRED``, ``LOCKED``, ``WORKSPACE_ARCHIVED``;
                ``CONFLICT`` when another executor took it already.
        """
        if checkout.manifest.archived is not None:
            name = f"{address.tenant}/{address.workspace}"
            raise ArchiveState(*checkout.manifest.archived).refusal(name)
        if checkout.manifest.lock is not None:
            lock = LockState(*checkout.manifest.lock)
            if lock.held_by_other(origin.session, datetime.now(UTC)):
                raise lock.refusal()
        if checkout.manifest.trust != "restricted":
            return False
        if not checkout.manifest.commands:
            raise QuillError(
                ErrorCode.DENIED,
                f"Commands are not offered on restricted workspace "
                f"{address.tenant}/{address.workspace}",
                {"trust": "restricted"},
            )
        t, w, approval_id = address.tenant, address.workspace, origin.request_id
        headers = origin.headers()
        headers.pop(HEADER_WAIT, None)
        headers.pop(HEADER_TIMEOUT, None)
        unpinned = msgspec.structs.replace(req, min_version=None)  # a retry asks the same
        body = codec.encode(unpinned)
        if self.secrets:  # no secret kept at rest: run without its client, it gets them redacted
            body = self.secrets.redact_bytes(body)[0]
        parked = Parked.of(op, headers, body)
        await self.kept.keep(t, w, approval_id, parked)
        view = self.quill.as_actor(origin.actor, session=origin.session, run=origin.run)
        ws = view.workspace(f"{t}/{w}")
        summary = approvals.summary(parked)[:4096]  # the writer shows what it derives so too
        await ws.request_approval(
            op, summary, request_id=approval_id, wait_ms=origin.wait_ms, digest=parked.digest
        )
        if not await self.kept.claim(t, w, approval_id, "executor"):
            raise Claimed(approval_id, checkout.limits.max_exec_ms / 1000)
        return True

    async def keeping(
        self,
        address: Address,
        origin: Origin,
        work: Awaitable[tuple[int, R]],
        asked: list[bool],
        result: type[R],
    ) -> tuple[int, R]:
        """``work`` (a command or a git action); when it asked for an approval (``asked``), its
        outcome kept under the request id for ``qry.approval``; an approved one sent again is
        answered with the outcome of the one that ran (``Claimed``)."""
        t, w, request_id = address.tenant, address.workspace, origin.request_id
        try:
            version, answer = await work
        except Claimed as claimed:
            return await self._claimed(address, claimed, result)
        except QuillError as exc:
            if asked[0]:
                await self.kept.record(t, w, request_id, error=exc)
            raise
        if asked[0]:
            await self.kept.record(t, w, request_id, version=version, result=answer)
        return version, answer

    async def _claimed(self, address: Address, claimed: Claimed, result: type[R]) -> tuple[int, R]:
        """An approved command sent again while (or after) it is carried out: answered with
        its outcome, once kept (it ran once).

        Raises:
            QuillError: its error; ``CONFLICT`` when its outcome is not kept in time.
        """
        t, w, approval_id = address.tenant, address.workspace, claimed.approval_id
        nc = self.quill.nc
        outcome = await self.kept.settled(nc, t, w, approval_id, claimed.within_s)
        if isinstance(outcome, QuillError):  # none past its longest run: its executor died
            raise outcome
        if outcome is None or (outcome.result is None and outcome.error is None):
            raise QuillError(
                ErrorCode.CONFLICT,
                f"Approved command {approval_id} is carried out already: its outcome is kept "
                "under its approval id (qry.approval)",
                {"approval_id": approval_id, "claimed": True},
            )
        if outcome.error is not None:
            details = {**outcome.error.details, "claimed": True}
            raise QuillError(outcome.error.code, outcome.error.message, details)
        return outcome.version or 0, msgspec.convert(outcome.result, result)


class Claimed(Exception):
    """An approved command another executor (or request) took already (``Approved.check``)."""

    def __init__(self, approval_id: str, within_s: float) -> None:
        super().__init__(approval_id)
        self.approval_id, self.within_s = approval_id, within_s
