"""Approvals by MCP elicitation: a mutation or command on a restricted workspace that comes back
``APPROVAL_REQUIRED`` is put to the MCP client's user, when the client can ask them.

Who decides: the person at the MCP client whose tool call is parked, about that call only. The
gateway never exposes an approve tool (a model could call it); it asks through elicitation,
which a client shows to its user, and records the answer as ``<actor> via MCP elicitation``.

* Protocol 2026-07-28 (one self-contained POST per request, as this gateway serves it): the tool
  answers an ``InputRequiredResult`` carrying the question and, as ``requestState``, the approval
  id and its workspace. The MCP library seals that state (AES-GCM under the gateway's key, bound
  to the tool, its arguments and the caller, for 10 minutes), so a client can neither forge it
  nor move it to another call. The client asks its user and calls the tool again with the
  answer: accept → approve, then send the parked request again (same request id): the writer
  (or the executor) answers it with what carrying it out gave → the real result; decline or
  cancel → deny, and the same request answers ``DENIED``.
* Earlier protocols: ``ctx.elicit`` in the call, where the transport has a back channel (the
  stateless JSON transport served here has none: such clients get ``APPROVAL_REQUIRED``).
* Clients without elicitation: ``APPROVAL_REQUIRED`` with the approval id in the details, for
  ``quill approve <id>``, telling the model to call ``wait_for_approval`` with it
  (``approvals``): Quill carries the call out once it is approved, and keeps what it gave
  under the approval id. Sending the same call again (same session) finds the same approval.

Gateways behind one address share ``QUILL_GATEWAY_STATE_KEY`` (any secret of 32+ characters) so
that the second round may land on another gateway; without it each process makes its own key.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import NoBackChannelError
from mcp.types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least
from nats.nuid import NUID
from pydantic import BaseModel, Field

from contracts.errors import ErrorCode, QuillError
from quill.client import Quill, Workspace
from services.gateway.access import Principal, principal_of, state_key

log = logging.getLogger("quill.gateway")

Ctx = Context[Any, Any]

KEY = "quill_approval"
"""The key of the approval question in ``input_requests``/``input_responses``."""
MODERN = "2026-07-28"
DECLINED = "declined in the MCP client"


class Decision(BaseModel):
    """What the user may add when answering (accept or decline is the answer itself)."""

    reason: str | None = Field(default=None, description="Optional: a note kept with the decision")


@dataclass(frozen=True)
class Parked:
    """A call waiting for approval ``approval_id`` on ``workspace`` (``tenant/name``)."""

    approval_id: str
    workspace: str

    def state(self) -> str:
        return json.dumps({"approval": self.approval_id, "workspace": self.workspace})

    @classmethod
    def from_state(cls, state: str) -> Parked:
        data = json.loads(state)  # sealed by the MCP library: we minted it
        return cls(str(data["approval"]), str(data["workspace"]))


def security() -> RequestStateSecurity:
    """How ``requestState`` is sealed: bound to the Quill principal that made the call."""
    return RequestStateSecurity(keys=[state_key()], bind_principal=_principal_claim)


def _principal_claim(ctx: ServerRequestContext[Any, Any]) -> str:
    request = ctx.request
    p = principal_of(getattr(request, "scope", {}))
    return f"{p.name} {p.actor}"


def can_elicit(ctx: Ctx) -> bool:
    caps = ctx.client_capabilities
    return caps is not None and caps.elicitation is not None


def _modern(ctx: Ctx) -> bool:
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, MODERN)


class _Same(NUID):
    """Request ids for a parked call sent again: always the parked request's own."""

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self._id = request_id.encode()

    def next(self) -> bytearray:
        return bytearray(self._id)


def again(ws: Workspace, request_id: str) -> Workspace:
    """``ws`` through a client whose next request carries ``request_id`` (the writer and the
    executor answer a decided approval's request by its id). One tool call, one request."""
    client = Quill.of(ws)
    view = client.as_actor(client.actor, session=client.session, run=client.run)
    view._nuid = _Same(request_id)
    return view.workspace(f"{ws.tenant}/{ws.name}")


@dataclass(frozen=True)
class Asked:
    """The call to approve, as the user sees it."""

    tool: str
    op: str | None
    path: str | None
    detail: str | None

    def question(self, ws: Workspace, approval_id: str) -> str:
        """``Allow write_file (cmd.write) on plan.md in restricted workspace acme/w?``"""
        what = f"{self.tool} ({self.op})" if self.op else self.tool
        on = f" on {self.path}" if self.path else ""
        detail = f": {self.detail}" if self.detail else ""
        where = f"restricted workspace {ws.tenant}/{ws.name}"
        return f"Allow {what}{on}{detail} in {where}? (approval {approval_id})"


async def decide(
    principal: Principal, ws: Workspace, parked: Parked, accepted: bool, reason: str | None
) -> None:
    """Record the user's answer (someone may have decided first, with ``quill approve``: then
    theirs stands, and sending the request again tells which it was)."""
    client = Quill.of(ws).as_actor(f"{principal.actor} via MCP elicitation"[:128])
    target = client.workspace(parked.workspace)
    try:
        if accepted:
            await target.approve(parked.approval_id, reason)
        else:
            await target.deny(parked.approval_id, reason or DECLINED)
    except QuillError as exc:
        if exc.code not in (ErrorCode.CONFLICT, ErrorCode.FILE_NOT_FOUND):
            raise


async def ask(
    ctx: Ctx, principal: Principal, ws: Workspace, asked: Asked, error: QuillError
) -> InputRequiredResult | Parked | None:
    """Put an ``APPROVAL_REQUIRED`` to the user: the ``InputRequiredResult`` to answer (2026-07-28),
    or, asked in the call (earlier protocols), the decided ``Parked``; None when the client
    cannot be asked."""
    approval_id = str(error.details.get("approval_id", ""))
    if not approval_id or not can_elicit(ctx):
        return None
    parked = Parked(approval_id, f"{ws.tenant}/{ws.name}")
    message = asked.question(ws, approval_id)
    schema = render_elicitation_schema(Decision)
    if _modern(ctx):
        params = ElicitRequestFormParams(message=message, requested_schema=schema)
        return InputRequiredResult(
            input_requests={KEY: ElicitRequest(params=params)}, request_state=parked.state()
        )
    try:
        answer = await ctx.elicit(message, Decision)
    except NoBackChannelError:
        return None
    accepted = answer.action == "accept"
    reason = answer.data.reason if answer.action == "accept" else None
    await decide(principal, ws, parked, accepted, reason)
    return parked


def resumed(ctx: Ctx) -> Parked | None:
    """The parked call this request answers for (its second round), if it is one."""
    state = ctx.request_state
    return Parked.from_state(state) if state else None


def reply(ctx: Ctx) -> tuple[bool, str | None]:
    """The user's answer on the second round: accepted?, and the note they added."""
    answer = (ctx.input_responses or {}).get(KEY)
    if not isinstance(answer, ElicitResult) or answer.action != "accept":
        return False, None
    note = (answer.content or {}).get("reason")
    return True, str(note)[:1000] if note else None
