"""What an approver is shown of a command is the command that will run.

Without ``--tenants`` any client may send ``cmd.request_approval`` (the executors' op): one that
asks first, under the request id and body digest of the command it sends next, with a summary
of its choosing ("ls"), had the approver shown "ls" and approve another command. The writer
now derives the summary from the command the executor keeps under that id and digest
(``infra/approvals.py: summary``), and refuses an ask for a command not kept.
"""

from __future__ import annotations

import secrets
from contextlib import AsyncExitStack

import pytest

from contracts import codec, hashing
from contracts import requests as rq
from contracts.errors import ErrorCode, QuillError
from tests.helpers import restricted_for_commands


async def test_the_summary_shown_is_the_command_kept(
    local_exec: AsyncExitStack, nats_url: str
) -> None:
    ws, desk = await restricted_for_commands(local_exec, nats_url, "acme/shown")
    evil = f"echo EVIL-{secrets.token_hex(4)} > pwned.txt"
    rid = f"req-{secrets.token_hex(6)}"
    digest = hashing.content_sha256(codec.encode(rq.RunCommand(command=evil)))

    with pytest.raises(QuillError) as info:  # nothing is kept under it: refused
        await ws.request_approval("exec.run", "ls", request_id=rid, digest=digest)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT, info.value
    with pytest.raises(QuillError) as info:
        await ws.request_approval("exec.run", "ls", request_id=f"{rid}-2")  # no digest
    assert info.value.code == ErrorCode.INVALID_ARGUMENT, info.value

    with pytest.raises(QuillError) as info:
        await ws.client.request(
            "exec", "acme", "shown", "run", rq.RunCommand(command=evil), dict, request_id=rid
        )
    assert info.value.code == ErrorCode.APPROVAL_REQUIRED, info.value
    ws.last_version = int(info.value.details["version"])
    shown = {a.approval_id: a.summary for a in (await ws.approvals()).pending}
    assert shown == {rid: evil}, shown  # what will run, and nothing else asked
    # asked again by a client with its own summary: the approval stays what was kept
    with pytest.raises(QuillError) as info:
        await ws.request_approval("exec.run", "ls", request_id=rid, digest=digest)
    assert info.value.code == ErrorCode.APPROVAL_REQUIRED, info.value
    assert [a.summary for a in (await ws.approvals()).pending] == [evil]
    await desk.deny(rid, reason="not that")
