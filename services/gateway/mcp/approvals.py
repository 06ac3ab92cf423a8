"""MCP at ``/mcp``: ``wait_for_approval``, for clients that cannot ask their user.

A call parked for approval on a restricted workspace is carried out by Quill once someone
approves it (``infra/approvals.py``); a client without elicitation (LangChain, the OpenAI
Agents SDK, curl) cannot send it again with the same request id, and need not: its model is
told the approval id and calls ``wait_for_approval`` with it, which waits for the decision and
answers what the call gave (a command's exit code and output, a write's result), or ``DENIED``
and why. It decides nothing (a model must not approve itself: ``endpoints.NO_TOOL``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from pydantic import Field

from contracts import replies as rp
from contracts.errors import ErrorCode, QuillError
from quill.client import Workspace
from services.gateway.mcp import command_texts
from services.gateway.mcp.table import READ_ONLY, Arg, Args, Tool, workspace_arg

NAME = "wait_for_approval"
ApprovalId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="The approval_id the call waiting for approval gave",
    ),
]
WaitMs = Annotated[
    int, Field(ge=0, le=600_000, description="How long to wait for the decision, in ms")
]
DEFAULT_WAIT_MS = 60_000


def told(error: QuillError) -> QuillError:
    """``APPROVAL_REQUIRED`` as a model without elicitation reads it: what to call next."""
    approval_id = str(error.details.get("approval_id", "?"))
    return QuillError(
        error.code,
        f"{error.message.split(':')[0]}: a person must approve it (quill approve). Do not send "
        f'this call again: call {NAME} with approval_id "{approval_id}" to wait for the '
        "decision and get this call's result.",
        error.details,
    )


async def wait(ws: Workspace, a: Args) -> rp.ApprovalStatus:
    """The approval once decided and carried out, or as it stands after ``timeout_ms``.

    Raises:
        QuillError: ``DENIED`` (denied or expired, and why); the error carrying it out gave.
    """
    status = await ws.wait_approval(a.approval_id, a.timeout_ms / 1000)
    if status.state in ("denied", "expired"):
        raise QuillError(ErrorCode.DENIED, denial(status), {"approval_id": status.approval_id})
    outcome = status.outcome
    if outcome is not None and outcome.error is not None:
        error = outcome.error
        raise QuillError(error.code, error.message, {**error.details, "approval_id": a.approval_id})
    return status


def denial(status: rp.ApprovalStatus) -> str:
    """Why an approval ended without being carried out."""
    if status.state == "expired":
        return f"Approval {status.approval_id} expired undecided: the call was not made"
    why = f": {status.reason}" if status.reason else ""
    return f"Denied by {status.decided_by or 'an approver'}{why}"


def approval_text(status: rp.ApprovalStatus) -> str:
    """What ``wait_for_approval`` answers: still waiting, or what the approved call gave."""
    if status.state == "pending":
        until = f" (it expires {status.expires:%Y-%m-%d %H:%M} UTC)" if status.expires else ""
        return (
            f"Approval {status.approval_id} is still pending{until}: nobody has decided "
            f"{status.summary!r} yet. Call {NAME} again to keep waiting."
        )
    outcome = status.outcome
    if outcome is None or outcome.result is None:
        return (
            f"Approval {status.approval_id} was approved; the call is being carried out. "
            f"Call {NAME} again for its result."
        )
    head = f"Approved by {status.decided_by or 'an approver'}; {status.summary} was carried out"
    return f"{head}.\n{result_text(status.op, outcome.result, outcome.version)}"


def result_text(op: str, result: dict[str, Any], version: int | None) -> str:
    """The approved call's result as its own tool would word it."""
    if op == "exec.run":
        return command_texts.command_text(msgspec.convert(result, rp.CommandResult))
    if op == "exec.git":
        return command_texts.git_text(msgspec.convert(result, rp.GitResult))
    return f"Workspace version {version}: {msgspec.json.encode(result).decode()}"


TOOLS = (
    Tool(
        NAME,
        "qry.approval",
        "Wait for the decision on a call that is waiting for approval (its approval_id), "
        "then answer what the call gave, or that it was denied. Quill makes the call itself "
        "once approved: never send the call again.",
        (
            Arg("approval_id", ApprovalId),
            Arg("timeout_ms", WaitMs, DEFAULT_WAIT_MS),
            workspace_arg(),
        ),
        lambda a, r: approval_text(r),
        READ_ONLY,
        path=None,
        detail=lambda a: a.approval_id,
        call=wait,
    ),
)
